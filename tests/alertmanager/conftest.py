"""Makes the ``alertmanager`` fixture (a real Alertmanager process) available to the tests here."""

from tests.alertmanager.server import alertmanager  # noqa: F401
