"""Money and limits: the monthly team and user budgets, the spend guard of a submit, and the
pure stop rules that end a run at its caps."""
