"""The model file the run's answers come from, watched for a change while the run goes on.

A worker maps its model file; it loads it again at each start (after a death, for a larger
context). A file replaced meanwhile (a re-download or a new quantization renamed over it) would
answer the rest of the run with another model, silently: a worker's start checks the identity of
the file at the path (runner/model/identity.py). A file written over in place (`cp` onto it, `dd
conv=notrunc`) changes the weights under the live workers' mappings without any start: the file
the run began with (every part of a split GGUF) stays open here, and each worker message's
answers are kept only after its status (size, mtime) is seen unchanged (an fstat, microseconds);
a changed status has its identity read again. A file renamed over the path leaves that one as it
was: the live workers answer on from it. A Ray node's file is that node's own and is not watched
from here.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from ...workers.spec import WorkerSpec
from ..errors import ModelError
from ..model.hub import model_parts
from ..model.identity import ModelIdentity, identify, identify_files

RERUN = ("The journal keeps the answers made before: put the first file back and run the same command again to "
         "finish, or start over on the new one with --fresh")


def _status(fds: list[int]) -> list[tuple[int, int]]:
    return [(st.st_size, st.st_mtime_ns) for st in map(os.fstat, fds)]


class ModelFile:
    def __init__(self, model: Optional[ModelIdentity]) -> None:
        self.model = model  # the identity the run began with (its journal's fingerprint holds it)
        # the files the run began with (every part of a split GGUF), whatever is renamed over their paths
        self._fds: list[int] = []
        try:
            for part in model_parts(model.path) if model is not None else []:
                self._fds.append(os.open(part, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:  # gone already: the first start says so
            self.close()
        self._status = _status(self._fds)

    def check_start(self, spec: WorkerSpec) -> None:
        """Before a worker (re)loads the file at its path: ModelError if it is another model now."""
        if self.model is not None and spec.node_id is None and self._other_model(identify, spec.model_path):
            raise ModelError(f"{spec.model_path}: the model file changed while the run went on, and a worker was "
                             f"to load it again: no answer comes from the new file. {RERUN}")

    def check_answers(self, spec: WorkerSpec) -> None:
        """Before a worker's answers are kept: ModelError if a file the run began with was written
        over since (those answers, made wholly or in part from the new bytes, are not kept)."""
        if not self._fds or spec.node_id is not None or _status(self._fds) == self._status:
            return
        held = [f"/proc/self/fd/{fd}" for fd in self._fds]
        if self._other_model(lambda path: identify_files(path, held), held[0]):
            raise ModelError(f"{spec.model_path}: the model file was written over while the workers answered from "
                             f"it: the answers made since are not kept. {RERUN}")
        self._status = _status(self._fds)  # touched, or copied over with the same bytes: the same model

    def _other_model(self, identity: Callable[[str], ModelIdentity], path: str) -> bool:
        """Whether the file is another model than the run's (its identity read again)."""
        assert self.model is not None
        try:
            now = identity(path)
        except ModelError:
            return True  # cut short or unreadable: not the run's model
        return (now.size_bytes, now.digest) != (self.model.size_bytes, self.model.digest)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
