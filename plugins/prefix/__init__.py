"""Prefix-cache locality: producers that estimate which endpoint holds a request's
prefix, and the data they hand to scorers, filters and P/D deciders."""
