"""Import audit for tests/benchmarks/test_gpu_check.py: on this directory's PYTHONPATH, every Python process records
each top-level module imported after startup, with the module that imported it, and writes the record at exit to
``$GPU_CHECK_IMPORT_LOG.<pid>.json``. The importer is the first frame outside importlib when the module is first
looked for, so what a third-party package pulls in by itself is told apart from what this repository imports."""

import atexit
import json
import os
import sys

_LOG = os.environ.get("GPU_CHECK_IMPORT_LOG")


class _Recorder:
    """A meta-path finder that finds nothing: it only notes who asked first for each top-level name."""

    def __init__(self) -> None:
        self.baseline = set(sys.modules)
        self.importer: dict[str, str | None] = {}

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in self.importer or top in self.baseline:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            mod = frame.f_globals.get("__name__", "") or ""
            if not (mod == "importlib" or mod.startswith(("importlib.", "_frozen_importlib"))) \
                    and frame.f_code.co_filename != __file__:
                break
            frame = frame.f_back
        self.importer[top] = None if frame is None else frame.f_globals.get("__name__")
        return None

    def write(self) -> None:
        tops = {m.partition(".")[0] for m in list(sys.modules)} - self.baseline
        out = {}
        for top in sorted(tops):
            mod = sys.modules.get(top)
            out[top] = {"importer": self.importer.get(top), "file": getattr(mod, "__file__", None)}
        with open(f"{_LOG}.{os.getpid()}.json", "w") as f:
            json.dump({"argv": sys.argv, "modules": out}, f)


if _LOG:
    _rec = _Recorder()
    sys.meta_path.insert(0, _rec)
    atexit.register(_rec.write)
