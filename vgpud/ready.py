"""`Ready`: how a supervised component says it is serving (a leaf module the components import)."""

from collections.abc import Callable

#: called once by a component when it is up; the supervisor counts its health from then on
Ready = Callable[[], None]
