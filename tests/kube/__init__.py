"""A Kubernetes API server for tests: KMock (PyPI `kmock`) plus a realism layer. A MOCK.

Start here: `kube.apiserver.running_apiserver()` (see that module's docstring).
"""
