import time

from uploader.limits import BACKOFF_SECONDS, MAX_RETRIES


def upload_with_backoff(send, payload, sleep=time.sleep):
    """Send `payload`; retry with exponential backoff."""
    for attempt in range(MAX_RETRIES + 1):
        try:
            return send(payload)
        except ConnectionError:
            if attempt == MAX_RETRIES:
                raise
            sleep(BACKOFF_SECONDS * 2 ** attempt)
