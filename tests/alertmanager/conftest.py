"""Makes the ``real_alertmanager`` fixture (a real Alertmanager process) available to the tests here."""

from tests.alertmanager.server import real_alertmanager  # noqa: F401
