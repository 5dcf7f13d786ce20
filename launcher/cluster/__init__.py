"""Where cells run: one backend per kind of cluster behind one interface (:mod:`launcher.cluster.base`),
found by name with :func:`launcher.cluster.backends.backend_for`."""
