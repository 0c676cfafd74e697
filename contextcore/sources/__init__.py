"""The context sources: each reads rows through the tenancy layer and returns items.

A source returns structured items; only the packer writes prose. Every source filters through
``request.subject`` alone and declares a strict options schema (``extra="forbid"``).
"""
