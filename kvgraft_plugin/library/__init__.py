"""A library at rest: its manifest and entries, where its files live, its saved states' fingerprint, its
embedding index and the template its entries are written in. Imports only `core`."""
