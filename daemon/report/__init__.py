"""The weekly report: pure figures from store records (``compute``), rendering
(``render``: text, HTML with inline charts), the mail (``mail``) and ``b300ctl report``."""
