"""The Textual chat front end of edgespec (``edgespec chat``)."""

from tui.app import ChatApp

__all__ = ["ChatApp"]
