"""An address's kept form (fairpost.mailer.sdk.suppression.normalize): its plain-address
shortcut gives what the full parse gives, for any text."""

from __future__ import annotations

import contextlib
from email.utils import parseaddr

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.mailer.sdk.suppression import normalize

PLAIN = st.text(alphabet="abcXYZ019!#$%&'*+/=?^_`{|}~.-@", max_size=12)
ANY = st.one_of(PLAIN, st.text(max_size=12), st.from_regex(r"[a-z.]{0,4}@[a-zA-Zü.]{0,5}", fullmatch=True))


def parsed(address: str) -> str:
    """The kept form by the full parse, every time (what normalize did for every address)."""
    bare = parseaddr(address)[1].strip().lower()
    local, at, domain = bare.rpartition("@")
    if at and not domain.isascii():
        import idna

        with contextlib.suppress(idna.IDNAError):
            domain = idna.encode(domain, uts46=True).decode("ascii")
    return f"{local}{at}{domain}"


@given(ANY)
@example("Ada.Lovelace+news@Example.ORG")
@example("ada@")
@example("@example.org")
@example("a@b@c")
@example("Ada <ada@example.org>")
@example("ada@bücher.example")
def test_the_shortcut_keeps_what_the_full_parse_keeps(address: str) -> None:
    assert normalize(address) == parsed(address)
