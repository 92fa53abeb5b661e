"""How the coordinator's messages count things: one owner for the singular and the plural."""


def counted(n: int, noun: str) -> str:
    """'1 worker', '2 workers', '0 answers' (nouns whose plural takes an s)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def layout_words(workers: int, threads: int, slots: int, up_to: bool = False) -> str:
    """'1 worker × 2 threads × 8 slots' (up_to: '× up to 8 slots')."""
    up = "up to " if up_to else ""
    return f"{counted(workers, 'worker')} × {counted(threads, 'thread')} × {up}{counted(slots, 'slot')}"
