"""A real ``transformers serve`` on loopback for the served-model tests: started on an ephemeral port,
stopped (its whole process group) at the end; ``restart`` brings it back on the same port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TRANSFORMERS = str(Path(sys.executable).parent / "transformers")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, log: Path, port: int | None = None, threads: int = 1, extra: list[str] | None = None) -> None:
        self.threads, self.extra = threads, list(extra or [])
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> Server:
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(self.threads), TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen([TRANSFORMERS, "serve", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--device", "cpu", "--log-level", "warning", *self.extra],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve did not come up in {timeout:.0f} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def restart(self) -> Server:
        self.stop()
        return self.start()


def merged_copy(base: Path, adapter: Path, out: Path | None = None) -> Path:
    """The adapter merged into a copy of the base (``merge_and_unload``), with the base's tokenizer files: what a
    server that loads whole models (``transformers serve``) serves for an adapter. Without ``out``, made once per
    machine beside the adapter in the test cache (``<adapter>-merged``, under the adapter's lock, appearing by an
    atomic rename), as the adapter itself is."""
    import shutil

    from lm_eval_toolfid.core.fsutil import exclusive
    from scripts.real_models import staged_folder

    out = Path(out) if out is not None else adapter.with_name(f"{adapter.name}-merged")
    if (out / ".complete").is_file():
        return out
    with exclusive(out.with_name(f".{out.name}.lock")):
        if (out / ".complete").is_file():
            return out
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter)).merge_and_unload()
        with staged_folder(out) as tmp:
            model.save_pretrained(tmp)
            for f in base.iterdir():
                if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens")) or f.suffix == ".jinja"
                                    or f.name == "generation_config.json"):
                    shutil.copy(f, tmp / f.name)
            (tmp / ".complete").write_text("ok\n")
    return out
