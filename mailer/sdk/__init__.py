"""What an application imports to enqueue mail: the client, the mail and its
attachments, MIME, a job's status, and the SQS wire format the daemon reads.
Nothing here needs AWS.
"""
