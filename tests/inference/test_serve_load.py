"""benchmarks/serve_load.py's load as a check (docs/SERVING.md): 1,000 requests from 16 concurrent
clients against experiments/serve.py in its own process, none failing, the server's RSS after
requests 501-1000 within 50 MiB of its RSS after 500, the admin route refusing a missing or wrong
token. Slow: a few minutes on 2 cores."""

import pytest


@pytest.mark.slow
def test_thousand_requests_sixteen_clients(load_script):
    out = load_script("benchmarks/serve_load.py").main(["--requests", "1000", "--clients", "16"])
    assert out["failed"] == 0 and out["warmup_failed"] == 0
    assert abs(out["rss_growth_mib"]) <= 50.0
    assert out["admin_without_or_wrong_token"] == [401, 401]
