"""The end-to-end campaign behind `stepcal quickstart`: profile → measure → fit → calibrate →
validate → report, each stage the library function its `stepcal` command calls.

config.py holds what to run, campaign.py the stages, headline.py the headline rows and table.
"""
from stepcal.experiments.campaign.campaign import Campaign, training_logs
from stepcal.experiments.campaign.config import CampaignConfig
from stepcal.experiments.campaign.headline import Headline, HeadlineRow, format_headline, target_summary

__all__ = ["Campaign", "CampaignConfig", "Headline", "HeadlineRow", "format_headline", "target_summary",
           "training_logs"]
