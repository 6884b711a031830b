"""Before `specpilot operator` starts kopf: can the Kubernetes API be reached at all?

Contract: `check_cluster(kubeconfig)` loads the credentials the way kopf and the operator's client
do (in a pod: the service account; else `kubeconfig`, $KUBECONFIG or ~/.kube/config, as kubectl
does) and asks the API server for /version once, without retries. Any HTTP answer means the
server is there (permissions are kopf's to report). A missing or unreadable kubeconfig, an
unknown host or a refused or timed-out connection raises `ClusterUnreachable`, whose message is
one line naming the server and the kubeconfig. Why: kopf retries a failed login forever, so an
operator started against the wrong cluster would hang without saying why.
"""

from __future__ import annotations

import os

CHECK_TIMEOUT_S = 10.0
"""Seconds for the one /version request: a reachable API server answers it at once."""


class ClusterUnreachable(RuntimeError):
    """The Kubernetes API cannot be reached with these credentials (one-line message)."""


def check_cluster(kubeconfig: str | None, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    import yaml
    from kubernetes import client, config

    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            where = "the pod's service account"
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
    except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise ClusterUnreachable(
            f"cannot load Kubernetes credentials from {where}: {_one_line(exc)}"
            " (set --kubeconfig or $KUBECONFIG)"
        ) from None
    configuration.retries = 0  # one attempt: this is a check, kopf retries later by itself
    server = configuration.host
    with client.ApiClient(configuration) as api:
        try:
            client.VersionApi(api).get_code(_request_timeout=timeout_s)
        except client.ApiException:
            return  # an HTTP answer (401, 403, ...): the server is there
        except Exception as exc:  # urllib3 and ssl errors, which share no base but Exception
            raise ClusterUnreachable(
                f"cannot reach the Kubernetes API at {server} (credentials from {where}):"
                f" {_one_line(exc)}"
            ) from None


def _one_line(exc: BaseException) -> str:
    # urllib3 nests the cause in a long repr; its last part says what happened
    text = " ".join(str(exc).split())
    reason = getattr(exc, "reason", None)
    if reason is not None:
        text = " ".join(str(reason).split())
    return text[:300]
