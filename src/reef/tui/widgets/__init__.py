"""Widgets the review screens share."""
