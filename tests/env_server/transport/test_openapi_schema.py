"""schemathesis against the live server's OpenAPI schema: no route answers a 5xx for any
generated request."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from env_server.cli import running_server


@pytest.fixture(scope="module")
def live_url():
    with running_server(["--grading-workers", "1", "--grading-timeout", "2"]) as url:
        yield url


def test_no_generated_request_gets_a_server_error(live_url) -> None:
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/reset", "/step", "/state", "/hints"}
    for operation in operations:
        strategy = operation.as_strategy()

        @settings(max_examples=25, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def check(case) -> None:
            response = case.call(base_url=live_url, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        check()
