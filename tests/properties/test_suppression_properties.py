"""An address's kept form (fairpost.mailer.sdk.suppression.normalize): its plain-address
shortcut gives what the full parse gives. Display names and Unicode domains, which
take the full parse, are tests/sdk/test_ses_addressing.py's."""

from __future__ import annotations

from email.utils import parseaddr

from hypothesis import example, given
from hypothesis import strategies as st

from fairpost.mailer.sdk.suppression import normalize

PLAIN = st.text(alphabet="abcXYZ019!#$%&'*+/=?^_`{|}~.-@", max_size=12)


@given(st.one_of(PLAIN, st.text(max_size=12)))
@example("Ada.Lovelace+news@Example.ORG")
@example("ada@")
@example("@example.org")
@example("a@b@c")
@example("ada@.")
def test_an_ascii_address_is_kept_as_the_full_parse_keeps_it(address: str) -> None:
    bare = parseaddr(address)[1].strip().lower()
    if bare.isascii():
        assert normalize(address) == bare
