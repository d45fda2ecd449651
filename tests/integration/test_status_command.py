import json
from io import StringIO

import pytest
from django.core.management import call_command

import shardq
from tests.taskapp import tasks


@pytest.mark.django_db
def test_status_reports_job_counts_and_the_ready_lag_as_json():
    shardq.enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
    out = StringIO()
    call_command("shardq_status", "--json", stdout=out)
    status = json.loads(out.getvalue())
    assert status["jobs"] == {"READY": 2}
    assert status["oldest_ready_seconds"] >= 0
    assert status["workers"] == []


@pytest.mark.django_db
def test_status_prints_a_table_for_people():
    out = StringIO()
    call_command("shardq_status", stdout=out)
    assert "unowned shards:" in out.getvalue() and "no READY job is due" in out.getvalue()
