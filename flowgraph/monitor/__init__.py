"""The training monitor: console progress with an adaptive ETA, a live web dashboard, reports.

>>> from flowgraph.monitor import Monitor
>>> with Monitor(total_epochs=100, report_path="report.html") as mon:   # doctest: +SKIP
...     mon.serve(port=3000)                 # http://127.0.0.1:3000
...     for epoch in range(100):
...         mon.log(epoch, seconds, g)       # or a dict of metrics

Importing this package is cheap: the server's packages (starlette, uvicorn) are imported by
``Monitor.serve()`` only, psutil, NVML and tqdm when first needed.
"""

from .monitor import Monitor, Terminated
from .source import MetricSource

__all__ = ["MetricSource", "Monitor", "Terminated"]
