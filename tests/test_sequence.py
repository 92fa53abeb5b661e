"""The stop rules of one sequence (workers/engine/sequence.py Sequence.accept): pure, no model."""

from array import array

from ggbatch.workers.engine.sequence import Phase, Sequence
from ggbatch.workers.protocol import FinishReason, GenerationParams, Question


def running(n_prompt=4):
    seq = Sequence(Question("q", array("i", range(n_prompt)), 0))
    seq.admit(0, 0)
    return seq


def test_end_of_generation_is_not_part_of_the_answer():
    seq = running()
    assert not seq.accept(7, b"Hi", False, GenerationParams(max_tokens=5), 100)
    assert seq.phase is Phase.DECODE and seq.t_first > 0
    assert seq.accept(2, b"</s>", True, GenerationParams(max_tokens=5), 100)
    assert (seq.output, seq.finish, seq.text()) == ([7], FinishReason.STOP, "Hi")


def test_ignore_eos_goes_on_to_max_tokens():
    seq, gen = running(), GenerationParams(max_tokens=2, ignore_eos=True)
    assert not seq.accept(2, b"a", True, gen, 100)
    assert seq.accept(2, b"b", True, gen, 100) and seq.finish is FinishReason.LENGTH and seq.text() == "ab"


def test_a_stop_string_split_across_tokens_cuts_the_answer_where_it_begins():
    seq, gen = running(), GenerationParams(max_tokens=50, stop=("\nQuestion:",))
    pieces = [b"4", b" apples", b"\nQue", b"stion:", b" more"]
    finished = [seq.accept(i, p, False, gen, 100) for i, p in enumerate(pieces[:4])]
    assert finished == [False, False, False, True]
    assert (seq.finish, seq.text()) == (FinishReason.STOP, "4 apples")


def test_the_context_full_ends_a_sequence_as_length():
    seq = running(n_prompt=8)
    assert not seq.accept(1, b"x", False, GenerationParams(max_tokens=50), 10)
    assert seq.accept(1, b"y", False, GenerationParams(max_tokens=50), 10) and seq.finish is FinishReason.LENGTH


def test_a_multibyte_character_across_tokens_is_whole_in_the_answer():
    seq, gen = running(), GenerationParams(max_tokens=3)
    euro = "€".encode()
    for i, piece in enumerate((euro[:1], euro[1:], b"!")):
        seq.accept(i, piece, False, gen, 100)
    assert seq.text() == "€!"
