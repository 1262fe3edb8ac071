"""What ``fairpost run`` runs: the app, the hand-off to SQS, the sender, SES,
the HTTP endpoints, health and metrics.
"""
