"""`fedpeer console`: a page on loopback that shows the federation and its jobs and proposes jobs
(fedpeer/app/console/server.py serves it, fedpeer/app/console/views.py shapes what it shows)."""
