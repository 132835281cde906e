"""tests/unit/routing/test_scalable_store.py against a real etcd: the tests that take ``metadata``
(tests/integration/routing/conftest.py)."""

from tests.support.recollect import collect_again

collect_again(globals(), "tests.unit.routing.test_scalable_store", "metadata")
