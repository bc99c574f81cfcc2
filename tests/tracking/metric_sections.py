"""How MLflow's UI files a metric into a chart section, for the tests of our metric names.

MLflow 3.17.2's run and experiment chart views (``extractChartSectionName`` and ``extractChartDisplayName``
in its bundled UI, mlflow/server/js): the section is the name up to its *last* ``/``, the chart title what
follows. ``tool/calls_per_response/mean`` made a section ``tool/calls_per_response`` holding a chart
titled "mean"; every metric this platform names has one ``/`` so each family is one section whose
charts carry whole names.
"""

from __future__ import annotations


def chart_section(name: str) -> str:
    """The chart section MLflow's UI puts metric ``name`` in ("" when it has no ``/``)."""
    return name.rsplit("/", 1)[0] if "/" in name else ""
