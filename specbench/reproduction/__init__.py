"""Reproductions of the papers' tables and figures: the run plan (``plan``), the exhibits built from
its run directories (``exhibits``), the published numbers beside them (``published``), the pattern
verdicts (``verdicts``) and the report that renders them (``render``)."""
