"""Built-in replication targets (entry-point group ``b300.replication_targets``).

``filesystem`` (:mod:`.filesystem`: another mount, NFS, Lustre...), ``sftp``
(:mod:`.sftp`: OpenSSH's ``ssh`` as the transport, host key checked against a
known_hosts file, never trusted on first use) and ``s3`` (:mod:`.s3`: boto3,
multipart uploads with SHA-256 checksums). Each implements
:class:`b300.interfaces.ReplicationTarget`. Partial copies are kept under
``<rel>.b300part`` on file-like targets so an interrupted copy continues where
it stopped; on S3 an interrupted multipart upload stays open and is continued
part by part. Nothing is imported here: loading one target never imports
another's client library.
"""
