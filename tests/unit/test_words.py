from tether.words import counted


def test_counted_nouns_agree_with_their_number() -> None:
    assert [counted(n, "worker") for n in (1, 2)] == ["1 worker", "2 workers"]
    assert counted(1, "process", "processes") == "1 process"
    assert counted(3, "process", "processes") == "3 processes"
