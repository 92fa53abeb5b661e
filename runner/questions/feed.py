"""The windows of a streamed question file after the first, made in a thread of the coordinator
while the workers answer the ones before (runner/questions/prepare.py makes them; runner/pool/pool.py takes
them as its pending questions run low).

    records ─▶ [thread] Preparer.windows ─▶ queue of one window ─▶ poll() in the pool's loop

The queue holds one window, so the thread is at most two windows ahead of the pool: memory holds
a few windows of questions whatever the file's size. Reading and rendering are Python (the GIL
is shared with the pool's loop, which is mostly waiting); tokenizing is in the tokenizer process.
Whatever stops the thread (a malformed line, a template error, the tokenizer process dying) is
raised by poll() in the pool's loop, which ends the run as any error there does.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Collection, Iterator, Optional, Union

from ...workers.protocol import Question
from ..errors import GgbatchError
from ..files.inputs import Record
from .prepare import Preparer, Window

log = logging.getLogger("ggbatch")

PUT_WAIT_S = 0.1  # how often a thread waiting to hand over a window checks whether it should stop
REST_CHUNK = 4096  # records looked up in the journal together once a run has stopped


class QuestionFeed:
    def __init__(self, preparer: Preparer, records: Iterator[Record], size: int,
                 on_window: Callable[[Window], None]) -> None:
        """on_window: called in the pool's thread with each window taken."""
        self._preparer, self._records, self._size = preparer, records, size
        self._on_window = on_window
        self._queue: queue.Queue[Union[Window, BaseException]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self.done = False
        self.wake_fd: Optional[int] = None  # polled: a window is made in a thread of its own
        self._thread = threading.Thread(target=self._make, name="ggbatch-windows", daemon=True)
        self._thread.start()

    def poll(self) -> Optional[list[Question]]:
        try:
            item = self._queue.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        self.done = item.last
        self._on_window(item)
        return item.questions

    def withdrawn(self) -> Collection[str]:
        """A job's questions are all asked to the end."""
        return ()

    def _make(self) -> None:
        try:
            for window in self._preparer.windows(self._records, self._size):
                if not self._hand_over(window) or window.last:
                    return
        except BaseException as exc:  # raised again in the pool's thread
            self._hand_over(exc)

    def _hand_over(self, item: Union[Window, BaseException]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=PUT_WAIT_S)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop making windows (the thread ends after the window it is making)."""
        self._stop.set()
        self._thread.join()

    def read_rest(self) -> None:
        """After a run ended early: the records not made into questions yet, so that the answers
        file still has a row for every question, with the answer the journal holds for it (a
        stopped rerun of a finished job writes the whole file again) or saying why it has none.
        A problem further on in the file ends the reading there."""
        self.close()
        if self.done:
            return
        maker = self._preparer.maker
        chunk: list[Record] = []
        stopped: Optional[GgbatchError] = None
        try:
            for rec in self._records:
                chunk.append(rec)
                if len(chunk) == REST_CHUNK:
                    maker.take_unmade(chunk)
                    chunk = []
        except GgbatchError as exc:
            stopped = exc
        if chunk:
            maker.take_unmade(chunk)
        if stopped is not None:
            log.warning("the answers file ends at %d rows: reading the rest of the questions stopped (%s)",
                        len(maker.ids), stopped)
