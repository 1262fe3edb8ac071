"""fairpost's mail side: the SDK, the mail worker and the sender."""
