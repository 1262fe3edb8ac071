"""Test support: daemons as real processes, the pipeline in the test's event loop, shared constants.

The services themselves (redis-server, moto, LocalStack, the recording SES) and
the one wait helper live in mailer.testing, where the demo and bench use them too.
"""

from dispatcher.keys import Keys

KEYS = Keys()
"""The keys under the default prefix, the one ``Settings()`` uses."""
