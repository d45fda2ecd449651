"""Job tags (docs/admin.md, "Tags and search"): labels an operator finds
jobs by, set with ``@shard_task(tags=[...])`` or ``.using(tags=[...])``.

Pure: ``normalize_tags`` checks a value and gives the tuple stored (sorted,
no duplicates), or raises ``ValueError`` saying what is wrong and what to do.
"""

from collections.abc import Iterable

#: At most this many tags a job: tags label, they do not carry data.
MAX_TAGS = 16
#: At most this many characters a tag.
MAX_TAG_CHARS = 100


def normalize_tags(value: object, where: str = "tags") -> tuple[str, ...]:
    """The tags of ``value`` (a list, tuple or set of non-empty strings),
    sorted and without duplicates; ``ValueError`` naming ``where`` otherwise."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(
            f"{where} must be a list of strings (e.g. tags=['billing']), not {_short(value)}: "
            "a single tag still goes in a list."
        )
    tags = set()
    for tag in value:
        if not isinstance(tag, str):
            raise ValueError(f"{where}: each tag must be a string, not {_short(tag)}.")
        if not tag.strip():
            raise ValueError(f"{where}: a tag must not be empty or only spaces ({tag!r}); drop it.")
        if len(tag) > MAX_TAG_CHARS:
            raise ValueError(
                f"{where}: the tag {tag[:20]!r}… is {len(tag)} characters, over {MAX_TAG_CHARS}; "
                "a tag is a short label (put data in the task's arguments)."
            )
        if any(ord(ch) < 32 or ch == "\x7f" for ch in tag):
            raise ValueError(f"{where}: the tag {tag!r} holds a control character; use plain text.")
        if not tag.isascii():
            try:
                tag.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{where}: the tag {tag!r} is not valid Unicode (a lone surrogate).") from None
        tags.add(tag)
    if len(tags) > MAX_TAGS:
        raise ValueError(f"{where}: {len(tags)} tags, over {MAX_TAGS}; keep the few an operator filters by.")
    return tuple(sorted(tags))


def _short(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:60] + "…"
