"""Node-local negative sampling server (RecIS ``LocalRpcDataSampler``)."""
