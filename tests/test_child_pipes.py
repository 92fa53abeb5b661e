"""A worker's results pipe is read without blocking (runner/child_pipes.py): messages come out whole
and in order, as Connection.send_bytes wrote them, and a writer stopped in the middle of a message
longer than the pipe's buffer holds up no read."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import multiprocess as mp
import pytest

from ggbatch.runner.child_pipes import FrameReader, whole_frames


def _send_all(connection, messages):
    for message in messages:
        connection.send_bytes(message)


def _read_until(reader: FrameReader, count: int, timeout: float = 20.0) -> list[bytes]:
    frames: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count and not reader.ended and time.monotonic() < deadline:
        frames += reader.read()
        time.sleep(0.01)
    return frames


@pytest.mark.timeout(60)
def test_messages_of_every_size_connection_writes_come_out_whole_and_in_order():
    reader_end, writer_end = mp.Pipe(duplex=False)
    reader = FrameReader(reader_end)
    # empty, small (header and bytes in one write), past 16 KiB (two writes), past the pipe's buffer
    messages = [b"", b"x" * 10, bytes(range(256)) * 80, os.urandom(300_000), b"last"]
    writer = threading.Thread(target=_send_all, args=(writer_end, messages))
    writer.start()
    frames = _read_until(reader, len(messages))
    writer.join(10)
    assert frames == messages
    writer_end.close()
    assert _read_until(reader, 1) == [] and reader.ended
    reader.close()


def test_a_message_longer_than_2_gib_has_its_length_after_a_minus_one():
    buffer = bytearray(struct.pack("!i", -1) + struct.pack("!Q", 5) + b"hello" + struct.pack("!i", 2) + b"ok")
    assert whole_frames(buffer) == [b"hello", b"ok"] and buffer == bytearray()


def test_a_partial_message_stays_in_the_buffer_until_it_is_whole():
    whole = struct.pack("!i", 6) + b"abcdef"
    buffer = bytearray(whole[:7])
    assert whole_frames(buffer) == [] and buffer == bytearray(whole[:7])
    buffer += whole[7:]
    assert whole_frames(buffer) == [b"abcdef"]


def _send_one(connection, message):
    connection.send_bytes(message)


@pytest.mark.timeout(60)
def test_a_writer_stopped_in_the_middle_of_a_long_message_holds_up_no_read():
    ctx = mp.get_context("spawn")
    reader_end, writer_end = ctx.Pipe(duplex=False)
    message = os.urandom(1 << 20)
    writer = ctx.Process(target=_send_one, args=(writer_end, message), daemon=True)
    writer.start()
    writer_end.close()
    reader = FrameReader(reader_end)
    try:
        assert reader_end.poll(20), "the writer process wrote nothing"
        time.sleep(0.2)  # the pipe's buffer is full: the writer waits in send_bytes
        os.kill(writer.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        assert reader.read() == [] and reader.read() == []
        assert time.monotonic() - t0 < 2, "a read waited for the stopped writer"
        os.kill(writer.pid, signal.SIGCONT)
        assert _read_until(reader, 1) == [message]
        writer.join(10)
        assert _read_until(reader, 1) == [] and reader.ended
    finally:
        if writer.is_alive():
            os.kill(writer.pid, signal.SIGCONT)
            writer.kill()
        reader.close()


@pytest.mark.timeout(60)
def test_a_message_torn_by_the_writers_death_is_dropped_at_the_end_of_the_pipe():
    reader_end, writer_end = mp.Pipe(duplex=False)
    reader = FrameReader(reader_end)
    writer_end.send_bytes(b"whole")
    os.write(writer_end.fileno(), struct.pack("!i", 100) + b"only part")
    writer_end.close()
    assert _read_until(reader, 2) == [b"whole"] and reader.ended
    reader.close()
