"""Grouping questions by the prefix they share, on crafted token arrays (runner/questions/prefix_groups.py)."""

import random
from array import array

from ggbatch.runner.questions.prefix_groups import MIN_SHARED, find_groups, grouped_order, whole_groups
from ggbatch.workers.protocol import Question


def prompt(*parts):
    return array("i", [t for part in parts for t in part])


SYSTEM = list(range(1, 11))  # 10 tokens every prompt starts with
PASSAGES = [list(range(100 * k, 100 * k + 60)) for k in (1, 2, 3)]  # 60 tokens each


def questions_on_passages(per_passage=4):
    return [prompt(SYSTEM, PASSAGES[p], [9000 + 10 * p + j] * (3 + j)) for p in range(3) for j in range(per_passage)]


def members(prompts, groups):
    return sorted(sorted(tuple(prompts[i]) for i in g.members) for g in groups)


def test_questions_on_one_passage_form_one_group_sharing_the_passage():
    prompts = questions_on_passages()
    groups = find_groups(prompts, n_prefix=len(SYSTEM))
    assert len(groups) == 3
    assert all(len(g.members) == 4 and g.shared == len(SYSTEM) + 60 for g in groups)
    # each group's members are the questions on one passage
    for g in groups:
        assert len({tuple(prompts[i][10:70]) for i in g.members}) == 1


def test_shuffled_input_finds_the_same_groups():
    prompts = questions_on_passages()
    shuffled = prompts[:]
    random.Random(3).shuffle(shuffled)
    assert members(shuffled, find_groups(shuffled, 10)) == members(prompts, find_groups(prompts, 10))


def test_no_sharing_beyond_the_job_prefix_gives_groups_of_one():
    prompts = [prompt(SYSTEM, [5000 + i] * 50) for i in range(6)]
    placed, sharing = grouped_order(prompts, n_prefix=10)
    assert sharing.groups == 0 and sharing.grouped == 0 and sharing.shareable == 0
    assert sorted(placed) == [(i, 0) for i in range(6)]


def test_sharing_shorter_than_min_shared_is_not_a_group():
    short = [prompt(SYSTEM, [7] * (MIN_SHARED - 1), [8000 + i] * 5) for i in range(3)]
    assert all(len(g.members) == 1 for g in find_groups(short, 10))
    long = [prompt(SYSTEM, [7] * MIN_SHARED, [8000 + i] * 5) for i in range(3)]
    assert [len(g.members) for g in find_groups(long, 10)] == [3]


def test_nested_sharing_keeps_the_inner_groups_next_to_each_other():
    # two subjects with their few-shot examples, two passages under each
    subject = {s: list(range(2000 + 100 * s, 2000 + 100 * s + 40)) for s in (0, 1)}
    passage = {(s, p): list(range(5000 + 100 * (2 * s + p), 5000 + 100 * (2 * s + p) + 50))
               for s in (0, 1) for p in (0, 1)}
    prompts = [prompt(SYSTEM, subject[s], passage[s, p], [9000 + j]) for s in (0, 1) for p in (0, 1) for j in range(3)]
    random.Random(5).shuffle(prompts)
    placed, sharing = grouped_order(prompts, 10)
    order = [i for i, _ in placed]
    assert sharing.groups == 2  # one per subject, its passages inside
    # in dispatch order, the questions on one passage are consecutive
    keys = [tuple(prompts[i][10:100]) for i in order]
    runs = [k for n, k in enumerate(keys) if n == 0 or k != keys[n - 1]]
    assert len(runs) == 4


def test_order_is_groups_by_work_longest_first_and_lists_every_prompt_once():
    prompts = questions_on_passages(per_passage=2) + [prompt(SYSTEM, [6000] * 300)]
    placed, sharing = grouped_order(prompts, 10)
    order, numbers = [i for i, _ in placed], [g for _, g in placed]
    assert sorted(order) == list(range(len(prompts)))
    assert numbers == [0, 1, 1, 2, 2, 3, 3]  # the single question is in no group
    assert order[0] == len(prompts) - 1  # the long single question is the most work
    assert sharing.groups == 3 and sharing.grouped == 6 and sharing.shareable == 3 * 60
    # within a group, in token order
    first_group = order[1:3]
    assert prompts[first_group[0]] < prompts[first_group[1]]


def test_a_group_sharing_as_a_tree_is_walked_depth_first():
    """Few-shot examples in a different order for each question (as lm-eval draws them): one
    group, whose questions come out so that those sharing the longest prefix are neighbours."""
    shots = [list(range(1000 * (k + 1), 1000 * (k + 1) + 40)) for k in range(3)]
    rng = random.Random(7)
    prompts = []
    for j in range(12):
        order = rng.sample(range(3), 3)
        prompts.append(prompt(SYSTEM, shots[0], *(shots[k] for k in order), [9000 + j] * (1 + j % 4)))
    placed, sharing = grouped_order(prompts, 10)
    sent = [prompts[i] for i, _ in placed]
    assert sharing.groups == 1
    assert sent == sorted(prompts)  # so each order of the shots is one run of neighbours


def test_an_empty_or_single_question_file():
    order, sharing = grouped_order([], 0)
    assert order == [] and sharing.groups == 0
    placed, sharing = grouped_order([prompt([1, 2, 3])], 0)
    assert placed == [(0, 0)] and sharing.groups == 0


def pending(*groups):
    return [Question(f"q{n}", array("i", [n]), 0, group=g) for n, g in enumerate(groups)]


def test_a_chunk_is_cut_back_to_where_a_group_starts():
    queue = pending(1, 1, 1, 2, 2, 2, 2, 3)
    assert whole_groups(queue, 5) == 3  # group 2 goes whole to the next worker
    assert whole_groups(queue, 3) == 3  # already at a boundary
    assert whole_groups(queue, 8) == 8  # everything


def test_a_group_larger_than_half_the_chunk_is_split():
    queue = pending(1, 2, 2, 2, 2, 2, 2, 2)
    assert whole_groups(queue, 4) == 4  # cutting back to 1 would leave a quarter of the chunk
    assert whole_groups(pending(0, 0, 0, 0, 0), 2) == 2  # questions in no group are never held back
