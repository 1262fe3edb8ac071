"""Defaults that serve real mail: a 2 MB PDF goes through with default settings."""

from __future__ import annotations

import os

import pytest

from fairpost import AsyncMailClient, Attachment
from fairpost.config import load_settings
from fairpost.mailer.testing.ses_server import SesServer
from fairpost.mailer.testing.wait import wait_for_async
from tests.support.pipeline import pipeline

# Every test here runs the pipeline against moto (SQS) and the recording SES.
pytestmark = pytest.mark.usefixtures("ses_env")


# aiohttp warns (ResourceWarning) about request bodies over 1 MiB; the tests turn warnings into errors.
@pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
async def test_a_2_mb_pdf_attachment_was_rejected_with_default_settings(
    redis_url: str, ses: SesServer
) -> None:
    # Only what a test needs to see the outcome quickly; the size cap is the default.
    settings = load_settings(redis_url=redis_url, sender={"wait_seconds": 1, "receivers": 1})
    pdf = Attachment("invoice.pdf", "application/pdf", os.urandom(2 * 1024 * 1024))
    async with pipeline(settings), AsyncMailClient(settings) as client:
        job_id = await client.send(
            "acme", sender="billing@example.com", to=["ada@example.org"], subject="Invoice", text="Attached.",
            attachments=[pdf],
        )  # fmt: skip

        async def sent() -> bool:
            return (await client.status(job_id)).state == "sent"

        await wait_for_async(sent, within=20, what="the mail with a 2 MB PDF")
    [mail] = ses.sent
    assert mail.raw_size is not None and mail.raw_size > 2 * 1024 * 1024 * 4 // 3
