"""The offline data generator (``streamrec-datagen``): the planted stream, the reference
DLRM's random data, real Criteo files and timestamped event logs laid into the streaming
layout.

Training never imports it (contract ``trainer-no-datagen``); it reads through the trainer's
data package where the two share a format.
"""
