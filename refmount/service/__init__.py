"""The service around one mount, apart from the filesystem it serves (``tree``,
``fuse_ops``): starting in the background (``daemon``), one mounted set and its trio main
loop (``serve``), reloading (``reload``), the control socket and ``refmount status``
(``control``, ``status``), progress while loading (``progress``) and systemd's notify
protocol (``notify``)."""
