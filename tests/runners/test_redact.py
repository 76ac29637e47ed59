"""Exception text shown to customers carries no server paths or addresses."""

from runners.redact import exception_text, redact


def test_it_cuts_absolute_paths_to_their_last_component():
    exc = FileNotFoundError(2, "No such file or directory", "/var/lib/dyno/media/org-3/models/7/config.json")
    text = exception_text(exc)
    assert "/var/lib" not in text and "org-3" not in text
    assert ".../config.json" in text and text.startswith("FileNotFoundError: ")


def test_it_keeps_what_helps_the_customer():
    message = "LlamaConfig has no vocab_size: the audit feeds token ids (seq 64 > 32 positions) at 12:30:45"
    assert redact(message) == message
    assert redact("ratio 1/2 and a/b stay") == "ratio 1/2 and a/b stay"  # not absolute paths


def test_it_hides_addresses_and_caps_the_length():
    text = redact("could not reach 10.0.3.17:5432 nor [fe80::1:2:3]:6379 from /home/runner/.cache/x")
    assert "10.0.3" not in text and "fe80" not in text and "/home" not in text
    assert text.count("<address>") == 2
    assert len(redact("x" * 5000)) == 1000
