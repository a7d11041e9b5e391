"""The agent: the program that runs on every machine and starts engines for the control plane.

It imports no Django models and needs no database; it shares only ``fleet.protocol`` and
``fleet.states`` with the control plane.
"""

VERSION = "0.1.0"
