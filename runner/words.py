"""How the coordinator's messages count things: one owner for the singular and the plural."""


def counted(n: int, noun: str) -> str:
    """'1 worker', '2 workers', '0 answers' (nouns whose plural takes an s)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
