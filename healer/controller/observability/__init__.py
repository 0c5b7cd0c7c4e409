"""What the controller says about itself: its Prometheus metrics, log lines for floods and dropped frames at
a bounded rate, and the watch on JetStream's storage.
"""
