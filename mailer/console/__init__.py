"""``fairpost console``: the operator's web console.

A separate process (``pip install 'fairpost[console]'``) that needs only
Redis (and SES's GetAccount for its account panel, where AWS is
configured). Its pages read through the modules the CLI uses (stats, the
quota admin, dead letters, suppression lists, job status) and its buttons
call the same functions: the console adds no state of its own to Redis.
Nothing imports it but the command line (pyproject.toml's layer contracts).

- :mod:`.app`: the aiohttp application and :func:`~.app.serve`;
- :mod:`.auth`: the token, the session cookie, CSRF;
- :mod:`.data` and :mod:`.tenants`: what the pages show; :mod:`.live`: SES's
  account and the send-rate chart;
- :mod:`.actions`: what the buttons do; :mod:`.pages` and :mod:`.posts`: the routes;
- :mod:`.views`: wording and masking, no I/O.
"""
