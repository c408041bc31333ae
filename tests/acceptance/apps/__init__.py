"""Helpers of the acceptance tests: Keel apps that real ``keel worker`` processes run
(``steps_app``), and the harness that starts and kills those processes."""
