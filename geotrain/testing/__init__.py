"""Seams for tests, public so users can test their own extensions the same way.

- :mod:`geotrain.testing.faultproxy`: a TCP proxy that passes, resets or blackholes a
  link after N bytes, or caps its byte rate (broken links for data-plane tests).

Child processes and local swarms (for tests too) are :mod:`geotrain.local`.
"""
