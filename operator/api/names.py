"""The SpecDeployment API's names, in one place: group, version, kind, plural, and the labels
and annotations SpecPilot writes on the objects it owns.

Contract: constants only. The CRD generator, the kopf handlers, the reconciler, the children
and the actuator all read these; a name written anywhere else is a bug.
"""

from __future__ import annotations

GROUP = "specpilot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SpecDeployment"
PLURAL = "specdeployments"
SINGULAR = "specdeployment"
SHORT_NAME = "spd"

FINALIZER = f"{GROUP}/finalizer"
KOPF_ANNOTATION_PREFIX = GROUP
"""Prefix of kopf's progress and diff-base annotations (the structural status would prune
kopf's own status fields)."""

CONFIG_ANNOTATION = f"{GROUP}/config"
"""Pod-template annotation holding the running SpecConfig as JSON."""
CANARY_SLOT_ANNOTATION = f"{GROUP}/replicas-before-canary"
"""On the main Deployment while a canary holds one of its replicas' place: the replica count
to give back (an operator killed mid-trial leaves it for the next one to restore)."""
ROLE_LABEL = f"{GROUP}/role"
ENGINE_LABEL = f"{GROUP}/engine"
SIDECAR_LABEL = f"{GROUP}/sidecar"
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP_NAME = "specpilot"
MANAGED_BY = "specpilot"
COMPONENT = "specpilot"
"""Events' source component."""

SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
"""Pod-template annotations telling annotation-driven Prometheus setups where /metrics is."""
OWNED_KEY_PREFIX = f"{GROUP}/"
"""Every label and annotation key under this prefix is SpecPilot's."""
OWNED_LABELS = (NAME_LABEL, INSTANCE_LABEL, MANAGED_BY_LABEL, ROLE_LABEL, ENGINE_LABEL)
"""Pod labels SpecPilot writes: its selectors and the Service's rely on them."""
OWNED_ANNOTATIONS = (CONFIG_ANNOTATION, *SCRAPE_ANNOTATIONS)
"""Pod annotations SpecPilot writes."""

SHM_VOLUME = "dshm"
SIDECAR_VOLUME = "specpilot-sidecar"
MODEL_CACHE_VOLUME = "model-cache"
OWNED_VOLUMES = (SHM_VOLUME, SIDECAR_VOLUME, MODEL_CACHE_VOLUME)
"""Engine pod volume names SpecPilot uses (a user's volumes must be named otherwise)."""
SHM_PATH = "/dev/shm"
