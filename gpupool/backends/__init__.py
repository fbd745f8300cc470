"""Where jobs run, behind one seam (:mod:`gpupool.backends.base`): local processes and Kubernetes pods."""
