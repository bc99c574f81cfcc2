"""``python -m retool_operator``: run the operator with the settings from RETOOL_OPERATOR_* variables.

Equivalent to ``kopf run -m retool_operator.handlers --standalone
--liveness=http://$RETOOL_OPERATOR_BIND_ADDRESS:$RETOOL_OPERATOR_LIVENESS_PORT/healthz`` plus ``--namespace`` for each
entry of RETOOL_OPERATOR_NAMESPACES, or ``--all-namespaces`` when it is empty.
"""

from __future__ import annotations

import logging

import kopf

from retool_operator import handlers


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = handlers.CONFIG
    namespaces = config.namespace_list
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://{config.bind_address}:{config.liveness_port}/healthz",
    )


if __name__ == "__main__":
    main()
