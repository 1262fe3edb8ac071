"""What an operator runs: stats, dead letters, queue set-up and the bodies of
the ``fairpost`` commands that are not the daemon.
"""
