"""Real services run locally, for the demo, the tests and the benchmarks.

- :mod:`fairpost.mailer.testing.services`: a throw-away ``redis-server`` and moto's AWS
  server on free ports, and the child-process handling they share.
- :mod:`fairpost.mailer.testing.localstack`: LocalStack's SQS, whose FIFO queues keep
  the rules moto breaks (from a source checkout).
- :mod:`fairpost.mailer.testing.ses_server`: a recording, fault-injecting SES v2 server.
- :mod:`fairpost.mailer.testing.wait`: waiting for a condition with a deadline.

Only the demo imports this package; the SDK, the quota engine, the operator
commands and the daemon never do (a layer contract in pyproject.toml). It
imports nothing of fairpost but its errors (``fairpost.mailer.errors``).
"""
