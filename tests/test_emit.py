"""Token -> text: UTF-8 across tokens, stop strings, EOS, the token limit (exact)."""

from __future__ import annotations

from specgen.emit import Emitter

PIECES = {
    1: b"Hel",
    2: b"lo",
    3: b" wor",
    4: b"ld",
    5: "ç".encode()[:1],  # first byte of a two-byte character
    6: "ç".encode()[1:],
    7: b"\n",
    8: b"END",
    9: b"",  # EOS
    10: "日".encode()[:2],
    11: "日".encode()[2:],
    12: b"ab",
    13: b"c",
    14: b"x lo wor y",
}


def make(**kw):
    return Emitter(PIECES.__getitem__, lambda t: t == 9, **kw)


def feed(e, toks):
    spans = [e.push(t, False) for t in toks]
    return [s.text for s in spans if s is not None]


def test_plain_concatenation_and_length():
    e = make(max_tokens=4)
    assert feed(e, [1, 2, 3, 4]) == ["Hel", "lo", " wor", "ld"]
    assert e.finish == "length" and e.text == "Hello world" and e.tokens == [1, 2, 3, 4]


def test_multibyte_character_split_across_tokens():
    e = make(max_tokens=10)
    assert feed(e, [5, 6, 10, 11]) == ["", "ç", "", "日"]
    assert e.text == "ç日"


def test_length_in_the_middle_of_a_character_flushes_a_replacement():
    e = make(max_tokens=1)
    assert feed(e, [10]) == ["\ufffd"]
    assert e.finish == "length"


def test_eos_is_neither_emitted_nor_counted():
    e = make(max_tokens=10)
    assert feed(e, [1, 2, 9]) == ["Hel", "lo"]
    assert e.finish == "eos" and e.tokens == [1, 2]


def test_ignore_eos_keeps_going():
    e = make(max_tokens=3, ignore_eos=True)
    feed(e, [1, 9, 2])
    assert e.finish == "length" and e.tokens == [1, 9, 2]


def test_stop_string_cut_exactly_when_completed_by_a_later_token():
    e = make(max_tokens=10, stop=("lo wo",))
    out = feed(e, [1, 2, 3])
    # "Hel" may be released, "lo" is held (prefix of the stop string), then cut
    assert "".join(out) == "Hel" and e.finish == "stop" and e.text == "Hel"


def test_held_text_is_released_when_the_stop_string_does_not_follow():
    e = make(max_tokens=10, stop=("lo!",))
    out = feed(e, [1, 2])
    assert "".join(out) == "Hel"  # "lo" held back
    out = feed(e, [3])
    assert "".join(out) == "lo wor"
    assert e.finish is None


def test_stop_inside_a_single_token_and_multiple_stops():
    e = make(max_tokens=10, stop=("zzz", "ND"))
    assert "".join(feed(e, [1, 8])) == "HelE"
    assert e.finish == "stop"


def test_close_flushes_held_text():
    e = make(max_tokens=10, stop=("lo!",))
    feed(e, [1, 2])
    assert e.close("length") == "lo"
    assert e.text == "Hello" and e.finish == "length"


def test_a_stop_token_id_ends_generation_and_is_kept():
    """vLLM's stop_token_ids: the token is emitted (its text and its count), then "stop"."""
    e = make(max_tokens=10, stop_ids=(3,))
    assert feed(e, [1, 2, 3]) == ["Hel", "lo", " wor"]
    assert e.finish == "stop" and e.tokens == [1, 2, 3] and e.text == "Hello wor"


def test_a_stop_token_id_releases_text_held_for_a_stop_string():
    e = make(max_tokens=10, stop=("lo!",), stop_ids=(2,))
    assert "".join(feed(e, [1, 2])) == "Hello"  # "lo" was a stop string's prefix
    assert e.finish == "stop"


def test_a_stop_token_id_ends_generation_under_ignore_eos_and_eos_still_wins_without():
    e = make(max_tokens=10, ignore_eos=True, stop_ids=(9,))
    feed(e, [1, 9])
    assert e.finish == "stop" and e.tokens == [1, 9]
    e = make(max_tokens=10, stop_ids=(9,))
    feed(e, [1, 9])
    assert e.finish == "eos" and e.tokens == [1]


def test_keep_stop_keeps_the_stop_string_and_cuts_what_follows():
    """vLLM's include_stop_str_in_output: the text ends with the stop string itself (the
    earliest one; among those starting there, the first given)."""
    e = make(max_tokens=10, stop=("lo wo",), keep_stop=True)
    assert "".join(feed(e, [1, 2, 3])) == "Hello wo" and e.finish == "stop"
    e = make(max_tokens=10, stop=("wor", "w", "lo"), keep_stop=True)
    assert "".join(feed(e, [1, 2])) == "Hello" and e.finish == "stop"
    e = make(max_tokens=10, stop=("wo", "wor"), keep_stop=True)
    assert "".join(feed(e, [3])) == " wo"
    e = make(max_tokens=10, stop=("wor", "wo"), keep_stop=True)
    assert "".join(feed(e, [3])) == " wor"


def test_eos_releases_text_held_for_a_stop_string_in_the_spans_and_the_text():
    # the non-streamed reply is the text, the stream is the spans: both hold "lo"
    e = make(max_tokens=10, stop=("lo!",))
    assert feed(e, [1, 2, 9]) == ["He", "l", "lo"]  # "l", then "lo", may start "lo!"
    assert e.finish == "eos" and e.text == "Hello" and e.tokens == [1, 2]


def test_the_longest_prefix_of_any_stop_string_is_held():
    # "ab" may start "abc" ("b" alone may start "bx"): hold both letters, then cut
    e = make(max_tokens=10, stop=("abc", "bx"))
    assert "".join(feed(e, [12, 13])) == "" and e.finish == "stop" and e.text == ""


def test_the_earliest_stop_string_in_a_token_cuts_whichever_was_given_first():
    e = make(max_tokens=10, stop=("wor", "lo"))
    assert "".join(feed(e, [14])) == "x " and e.finish == "stop"


def test_an_empty_stop_string_stops_nothing():
    e = make(max_tokens=2, stop=("",))
    assert "".join(feed(e, [1, 2])) == "Hello" and e.finish == "length"


def test_a_stop_token_id_ending_in_half_a_character_flushes_a_replacement():
    e = make(max_tokens=10, stop_ids=(5,))
    assert "".join(feed(e, [1, 5])) == "Hel\ufffd" and e.text == "Hel\ufffd"
    assert e.finish == "stop"
