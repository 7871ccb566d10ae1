"""dpaudit.reports"""
